"""The program behind mpirun-failing-rank.log: a progress line on stderr, then rank 1 fails with a traceback
(`fab train --nodes 3 --cluster local:NAME --script failing_rank.py --independent-ranks`)."""
import os
import sys
import time

rank = int(os.environ.get("RANK", "0"))
for i in range(3):
    sys.stderr.write(f"\rstep {i}/3")
    sys.stderr.flush()
    time.sleep(0.05)
print(f"rank {rank} at step 3", flush=True)
if rank == 1:
    raise ValueError("bad batch on rank 1")
time.sleep(0.5)
