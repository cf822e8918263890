"""The program behind mpirun-three-ranks.log: partial lines, carriage-return progress on stderr and stdout,
ANSI colour, several lines in one write, every rank at once
(`fab train --nodes 3 --cluster local:NAME --script three_ranks.py --independent-ranks`)."""
import os
import sys
import time

rank = int(os.environ.get("RANK", "0"))
world = int(os.environ.get("WORLD_SIZE", "1"))
print(f"rank {rank} of {world} starting", flush=True)
# a line written in pieces
for word in ("{'loss':", " 1.2345,", " 'grad_norm':", " 0.5,", f" 'rank': {rank}}}"):
    sys.stdout.write(word)
    sys.stdout.flush()
    time.sleep(0.05)
sys.stdout.write("\n")
sys.stdout.flush()
# a progress bar with carriage returns (as tqdm draws it), on stderr
for i in range(0, 11):
    sys.stderr.write(f"\rprogress {i * 10:3d}%|{'#' * i}{' ' * (10 - i)}| {i}/10")
    sys.stderr.flush()
    time.sleep(0.03)
sys.stderr.write("\n")
# colour
print(f"\x1b[32mok\x1b[0m rank {rank} \x1b[1mbold\x1b[0m", flush=True)
# many short writes at once from every rank
for i in range(5):
    sys.stdout.write(f"{rank} {i} ")
    sys.stdout.flush()
sys.stdout.write("done\n")
sys.stdout.flush()
sys.stdout.write(f"chunk a {rank}\nchunk b {rank}\nchunk c {rank}\n")
sys.stdout.flush()
for i in range(0, 6):
    sys.stdout.write(f"\r{i}/5 steps [\x1b[36m{'=' * i}\x1b[0m]")
    sys.stdout.flush()
    time.sleep(0.02)
sys.stdout.write("\n")
sys.stdout.flush()
print(f"rank {rank} warning on stderr", file=sys.stderr, flush=True)
