"""Run a user's program as `python SCRIPT` or `python -m MODULE` would, then end the process cleanly.

    python -m xeon_cluster.run --script PATH [-- ARGS...]
    python -m xeon_cluster.run --module NAME [-- ARGS...]

Every rank of `fab train --script/--module` runs its program through this (cluster/job/userjob.py
UserProgram.argv), so a program runs without a line changed. The program runs with runpy
(`run_path(run_name="__main__")` or `run_module(alter_sys=True)`): `__name__` is "__main__",
`__file__` and sys.argv[0] are the script's absolute path (the module's file), sys.argv[1:] is
ARGS, and sys.path[0] is the script's folder (for `--module`, the working directory), as plain
`python` sets them (it only keeps sys.argv[0] as typed), so a workdir's own `training/` package or
`cluster.py` is the one imported.

When the program ends (returns, raises SystemExit, or raises anything else, whose traceback is
printed as Python prints it and which exits 1) the process ends the way interpreter exit would
begin: it waits for the program's non-daemon threads, runs its atexit handlers, destroys the torch
process group if the program left one (torch is never imported here otherwise), flushes files the
program left open and stdout/stderr, and then leaves with os._exit, skipping the destructors that
run after that. With torch 2.13 and gloo, one of those destructors can deadlock: a DDP model's
reducer, freed at exit, destroys the gloo process group it still holds (even after
destroy_process_group) while its peers are gone, and the rank never ends.

Two things every rank's program gets from the runner, without a line of it changed:

- The multi-CPU world of accelerate. The launch sets ACCELERATE_USE_CPU=true in every rank's
  environment (CPU_WORLD_ENV, cluster/job/launch.py), which `Accelerator()` and `Trainer` read; a bare
  `PartialState()` does not read it (accelerate only honours it in AcceleratorState), so when the
  variable is true the runner makes PartialState's `cpu` default to it, as `Accelerator()` does.
  Without it, on a machine with no GPU, each rank would train alone with DistributedType.NO.
- A record of the world it joined. init_process_group is observed (torch is never imported for
  it: the hook runs when the program imports torch.distributed); when a group of WORLD_SIZE ranks
  was formed at any point, or at the program's end, the rank writes a JSON record (WORLD_RECORD_KEYS)
  into the folder named by XEON_CLUSTER_RANK_DIR, which `fab train` reads when the job ends: a
  multi-rank job whose ranks never joined one group is reported as ranks that trained alone.

Self-contained like the rest of the package: nothing of the toolkit's `cluster` or `training` is
imported, so the user's own modules of those names are never shadowed.
"""

from __future__ import annotations

import atexit
import functools
import importlib.abc
import io
import json
import os
import runpy
import signal
import sys
import threading

SCRIPT_OPTION = "--script"
MODULE_OPTION = "--module"
ARGS_SEPARATOR = "--"
USAGE = (f"python -m {__spec__.name if __spec__ else __name__} "
         f"{SCRIPT_OPTION} PATH | {MODULE_OPTION} NAME [{ARGS_SEPARATOR} ARGS...]")
BAD_USAGE_CODE = 2  # as `python missing.py` exits
STDOUT_FLUSH_FAILED_CODE = 120  # what Python exits with when it cannot flush stdout at exit
_FILE_TYPES = (io.TextIOWrapper, io.BufferedWriter, io.BufferedRandom)  # what may hold unwritten bytes
# accelerate's own variable (what `accelerate launch --cpu` sets): true makes Accelerator(), Trainer
# and, through the runner, PartialState() form a multi-CPU world from RANK/WORLD_SIZE or MPI's variables.
ACCELERATE_CPU_VARIABLE = "ACCELERATE_USE_CPU"
# Where a rank writes its world record (the rank wrapper sets it: the job's ranks folder on the node).
RANK_DIR_VARIABLE = "XEON_CLUSTER_RANK_DIR"
WORLD_RECORD_PREFIX = "world-"  # WORLD_RECORD_PREFIX + RANK + ".json" in RANK_DIR_VARIABLE's folder
# The exit code a rank has decided on before its teardown (OUTCOME_RECORD_PREFIX + RANK in the same folder): the
# built-in job records its spot-notice exit once its checkpoint is saved, so that the job script keeps that outcome
# when the launcher kills the rank during its exit (a reclaimed node's rank ended first) and returns another code.
OUTCOME_RECORD_PREFIX = "outcome-"
# rank, WORLD_SIZE it was started with, whether it joined a group of that size, the largest group it saw
WORLD_RECORD_KEYS = ("rank", "expected", "joined", "largest")
_TRUE = ("y", "yes", "t", "true", "on", "1")  # accelerate's truthy values (str_to_bool)


class UsageError(ValueError):
    """A bad command line of the runner; one line naming the option, the value and what is allowed."""


def parse(argv: list[str]) -> tuple[str, str, list[str]]:
    """(SCRIPT_OPTION or MODULE_OPTION, the path or module name, the program's arguments)."""
    if len(argv) < 2 or argv[0] not in (SCRIPT_OPTION, MODULE_OPTION):
        shown = argv[0] if argv else ""
        raise UsageError(f"xeon_cluster.run: {shown!r} is not allowed first; allowed: {USAGE}")
    kind, target, rest = argv[0], argv[1], argv[2:]
    if not target or target.startswith("-"):
        raise UsageError(f"{kind}: {target!r} is not a {'path' if kind == SCRIPT_OPTION else 'module name'}; "
                         f"allowed: {USAGE}")
    if rest and rest[0] != ARGS_SEPARATOR:
        raise UsageError(f"xeon_cluster.run: {rest[0]!r} after {kind} {target}; allowed: the program's arguments "
                         f"after {ARGS_SEPARATOR!r} ({USAGE})")
    return kind, target, rest[1:]


def script_dir(path: str) -> str:
    """sys.path[0] of `python PATH`: the folder of the file a symlinked script points to, absolute."""
    for _ in range(40):  # as many links as the kernel follows
        if not os.path.islink(path):
            break
        target = os.readlink(path)
        path = target if os.path.isabs(target) else os.path.join(os.path.dirname(path), target)
    return os.path.dirname(os.path.abspath(path))


def _user_traceback(tb):
    """`tb` without the frames of this runner and of runpy, as `python SCRIPT` would show it."""
    while tb is not None and (tb.tb_frame.f_globals is globals() or tb.tb_frame.f_globals is vars(runpy)):
        tb = tb.tb_next
    return tb


def exit_code(value: object) -> int:
    """The process's exit code for SystemExit(value), as Python's own exit computes it."""
    if value is None:
        return 0
    if isinstance(value, int):
        return value if -(2 ** 31) <= value < 2 ** 31 else -1
    try:
        print(value, file=sys.stderr)
    except Exception:  # noqa: BLE001 - an unprintable exit value still exits 1
        pass
    return 1


def run(kind: str, target: str, args: list[str]) -> None:
    """The program, with the sys.argv and sys.path plain `python` would give it."""
    if kind == SCRIPT_OPTION:
        if not os.path.exists(target):
            raise UsageError(f"{SCRIPT_OPTION}: {target!r} does not exist in {os.getcwd()}; allowed: a Python file "
                             "(or a folder or zip file with __main__.py)")
        sys.argv[:] = [target, *args]  # run_path puts the absolute path in sys.argv[0] and __file__
        if not getattr(sys.flags, "safe_path", False) and sys.path:  # (-m put the working directory there)
            if os.path.isfile(target) and not _is_zip(target):
                sys.path[0] = script_dir(target)
            else:
                del sys.path[0]  # run_path puts the folder or zip file there itself
        runpy.run_path(os.path.abspath(target), run_name="__main__")
    else:
        import importlib.util

        try:
            found = importlib.util.find_spec(target)
        except (ModuleNotFoundError, ValueError):  # a missing parent package, a relative name
            found = None
        if found is None:
            raise UsageError(f"{MODULE_OPTION}: no module named {target!r} on the path (from {os.getcwd()}); "
                             "allowed: a module of the workdir or of the node's venv")
        sys.argv[:] = [target, *args]  # run_module puts the module's file in sys.argv[0]
        runpy.run_module(target, run_name="__main__", alter_sys=True)


def _is_zip(path: str) -> bool:
    import zipfile

    return zipfile.is_zipfile(path)


# ----------------------------------------------------------------------------- observing the program


class World:
    """What this rank saw of torch.distributed: the largest process group it joined."""

    def __init__(self, environ=os.environ):
        self.rank = _int(environ.get("RANK"), 0)
        self.expected = _int(environ.get("WORLD_SIZE"), 1)
        self.folder = environ.get(RANK_DIR_VARIABLE) or ""
        self.largest = 0
        self.written = False

    @property
    def joined(self) -> bool:
        return self.largest >= self.expected

    def saw(self, size: int) -> None:
        """A process group of `size` ranks was formed; the record is written when it is the expected one."""
        first = not self.joined
        self.largest = max(self.largest, size)
        if first and self.joined:
            self.write()

    def record(self) -> dict:
        return dict(zip(WORLD_RECORD_KEYS, (self.rank, self.expected, self.joined, self.largest)))

    def write(self) -> None:
        if not self.folder:
            return
        path = os.path.join(self.folder, f"{WORLD_RECORD_PREFIX}{self.rank}.json")
        self.written = _write_record(path, json.dumps(self.record()), "world record")


def _write_record(path: str, text: str, what: str) -> bool:
    """`text` into `path` whole (through a temporary file); a failure is one line on stderr, never an error."""
    try:
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(path + ".tmp", path)
        return True
    except OSError as exc:
        print(f"[xeon-cluster] cannot write the {what} {path}: {exc}", file=sys.stderr)
        return False


def record_outcome(code: int, environ=os.environ) -> None:
    """Record the exit code this rank has decided on (OUTCOME_RECORD_PREFIX); nothing outside a job's rank."""
    folder = environ.get(RANK_DIR_VARIABLE) or ""
    if not folder:
        return
    _write_record(os.path.join(folder, f"{OUTCOME_RECORD_PREFIX}{_int(environ.get('RANK'), 0)}"), f"{int(code)}\n",
                  "outcome record")


def _int(text, default: int) -> int:
    try:
        return int(text)
    except (TypeError, ValueError):
        return default


def observe_init(module, world: World) -> None:
    """torch.distributed (and its distributed_c10d) with init_process_group telling `world` the group's size."""
    c10d = getattr(module, "distributed_c10d", None)
    original = getattr(module, "init_process_group", None)
    if original is None or getattr(original, "_xeon_cluster_observed", False):
        return

    @functools.wraps(original)
    def init_process_group(*args, **kwargs):
        result = original(*args, **kwargs)
        try:
            world.saw(module.get_world_size())
        except Exception:  # noqa: BLE001 - observing must never break the program
            pass
        return result

    setattr(init_process_group, "_xeon_cluster_observed", True)  # noqa: B010  (a mark on a wrapper: typed code)
    module.init_process_group = init_process_group
    if c10d is not None and getattr(c10d, "init_process_group", None) is original:
        c10d.init_process_group = init_process_group


def cpu_by_default(module, environ=os.environ) -> None:
    """accelerate.state with PartialState's `cpu` true by default when ACCELERATE_USE_CPU is (as
    AcceleratorState already reads it)."""
    cls = getattr(module, "PartialState", None)
    if cls is None or getattr(cls.__init__, "_xeon_cluster_observed", False):
        return
    original = cls.__init__

    @functools.wraps(original)
    def __init__(self, cpu: bool = False, **kwargs):
        if not cpu and (environ.get(ACCELERATE_CPU_VARIABLE) or "").strip().lower() in _TRUE:
            cpu = True
        original(self, cpu, **kwargs)

    setattr(__init__, "_xeon_cluster_observed", True)  # noqa: B010
    cls.__init__ = __init__


class _Loader(importlib.abc.Loader):
    """A module's own loader, then `hook(module)` once the module has run."""

    def __init__(self, loader, hook):
        self._loader, self._hook = loader, hook

    def __getattr__(self, name):  # get_source, get_resource_reader, ... as the real loader answers them
        return getattr(self._loader, name)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        try:
            self._hook(module)
        except Exception as exc:  # noqa: BLE001 - observing must never break the program
            print(f"[xeon-cluster] could not observe {module.__name__}: {exc!r}", file=sys.stderr)


class AfterImport(importlib.abc.MetaPathFinder):
    """Runs hooks[name](module) right after the program first imports module `name`."""

    def __init__(self, hooks: dict):
        self.hooks = hooks

    def find_spec(self, name, path=None, target=None):
        hook = self.hooks.get(name)
        if hook is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader, hook)
                return spec
        return None


def observe(world: World) -> AfterImport:
    """The hooks on torch.distributed and accelerate.state, installed (modules already imported: hooked now)."""
    hooks = {"torch.distributed": lambda m: observe_init(m, world), "accelerate.state": cpu_by_default}
    for name, hook in hooks.items():
        if name in sys.modules:
            hook(sys.modules[name])
    finder = AfterImport(hooks)
    sys.meta_path.insert(0, finder)
    return finder


# ----------------------------------------------------------------------------- the end


def _join_threads() -> None:
    """Wait for the program's non-daemon threads, with what the interpreter itself calls at exit:
    threading's exit hooks first (they let the workers of a ThreadPoolExecutor left open go), then
    the join."""
    threading._shutdown()  # type: ignore[attr-defined]  # private, what the interpreter calls at exit


def _destroy_process_group() -> None:
    """destroy_process_group() if the program imported torch.distributed and left a group."""
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return
    try:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    except Exception as exc:  # noqa: BLE001 - the program has ended; its exit code stands
        print(f"[xeon-cluster] destroy_process_group at exit failed: {exc!r}", file=sys.stderr)


def _flush_open_files() -> None:
    """Flush every file object still open, as closing them at interpreter exit would."""
    import gc

    std = (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)
    for obj in gc.get_objects():
        # (type(), not isinstance: some objects warn when their __class__ is read)
        if issubclass(type(obj), _FILE_TYPES) and all(obj is not s for s in std):
            try:
                if not obj.closed and obj.writable():
                    obj.flush()
            except Exception:  # noqa: BLE001 - a file that cannot be flushed would be lost at exit too
                pass


def end(code: int, world: World | None = None) -> int:
    """What interpreter exit does first, for a program that ended with `code`; the code to exit with.
    `world`: its record is written (unless it was, when the rank joined its group)."""
    _join_threads()
    try:
        atexit._run_exitfuncs()  # prints a failing handler's traceback itself
    except BaseException:  # noqa: BLE001 - older Pythons re-raise the last handler's error
        pass
    if world is not None and not world.written:
        world.write()
    _destroy_process_group()
    _flush_open_files()
    for stream in (sys.stderr, sys.__stderr__):
        try:
            if stream is not None:
                stream.flush()
        except Exception:  # noqa: BLE001
            pass
    for stream in (sys.stdout, sys.__stdout__):
        try:
            if stream is not None:
                stream.flush()
        except Exception:  # noqa: BLE001
            if code == 0:
                code = STDOUT_FLUSH_FAILED_CODE
    return code


def main(argv: list[str]) -> None:
    try:
        kind, target, args = parse(argv)
    except UsageError as exc:
        print(exc, file=sys.stderr)
        sys.exit(BAD_USAGE_CODE)
    interrupted = False
    world = World()
    observe(world)
    try:
        run(kind, target, args)
        code = 0
    except SystemExit as exc:
        code = exit_code(exc.code)
    except UsageError as exc:
        print(exc, file=sys.stderr)
        code = BAD_USAGE_CODE
    except BaseException as exc:  # noqa: BLE001 - what Python does with an uncaught exception
        interrupted = isinstance(exc, KeyboardInterrupt)
        exc.__traceback__ = tb = _user_traceback(exc.__traceback__)  # (printing reads the exception's own)
        try:
            sys.excepthook(type(exc), exc, tb)
        except Exception:  # noqa: BLE001 - a broken excepthook: Python falls back to its own printing
            import traceback

            traceback.print_exception(type(exc), exc, tb)
        code = 1
    code = end(code, world)
    if interrupted:  # Python ends by SIGINT after an uncaught KeyboardInterrupt
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)


if __name__ == "__main__":
    main(sys.argv[1:])
