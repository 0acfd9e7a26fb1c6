"""keep_freed_memory, in every Atari file: after it, memory freed by one update serves the next without faulting in
again page by page (glibc's malloc otherwise maps each large block on its own and unmaps it when freed)."""

import inspect
import platform
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ALGOS, load_algo

ATARI_FILES = ["impala", "seed", "ddppo", "a3c", "apex", "r2d2"]
PAGES = (256 << 20) // 4096

# a child process: a 256 MiB tensor allocated and freed eight times, as an update's batch is; it prints the fewest
# page faults of one allocation after the first two (the heap may take a few rounds to hold the pattern)
CHILD = """
import importlib.util, resource, sys
import torch
if sys.argv[1]:
    spec = importlib.util.spec_from_file_location("algo", sys.argv[1])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.keep_freed_memory()
faults = []
for _ in range(8):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    block = torch.ones(64 << 20)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    del block
print(min(faults[2:]))
"""


def late_allocation_faults(path: str) -> int:
    out = subprocess.run([sys.executable, "-c", CHILD, path], capture_output=True, text=True, timeout=120, check=True)
    return int(out.stdout.split()[-1])


def glibc() -> bool:
    return sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"


@pytest.mark.skipif(not glibc(), reason="glibc's malloc only")
def test_without_it_a_freed_block_faults_in_again():
    # the control: what keep_freed_memory removes is there to remove (unless huge pages back every block)
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if thp.exists() and "[always]" in thp.read_text():
        pytest.skip("transparent huge pages always on: few faults either way")
    assert late_allocation_faults("") > PAGES // 2


@pytest.mark.skipif(not glibc(), reason="glibc's malloc only")
@pytest.mark.parametrize("name", ATARI_FILES)
def test_keep_freed_memory_reuses_a_freed_block(name):
    assert late_allocation_faults(str(ALGOS / f"{name}.py")) < PAGES // 20


@pytest.mark.parametrize("name", ATARI_FILES)
def test_the_run_sets_it_at_start(name):
    # before the actors fork (they inherit it) and before the learner allocates anything large
    source = inspect.getsource(load_algo(name).Run.__init__)
    assert source.index("keep_freed_memory()") < source.index("self.args = args")


# a child process: with freed memory kept, a freed 256 MiB block stays resident until release_freed_memory; it
# prints the resident MiB after the free and after the release
RELEASE = """
import importlib.util, os, sys
import torch
spec = importlib.util.spec_from_file_location("algo", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
module.keep_freed_memory()
def resident():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
block = torch.ones(64 << 20)
del block
kept = resident()
module.release_freed_memory()
print(kept, resident())
"""


@pytest.mark.skipif(not glibc(), reason="glibc's malloc only")
@pytest.mark.parametrize("name", ["apex", "r2d2"])
def test_a_checkpoints_replay_is_given_back_after_its_restore(name):
    command = [sys.executable, "-c", RELEASE, str(ALGOS / f"{name}.py")]
    out = subprocess.run(command, capture_output=True, text=True, timeout=120, check=True)
    kept, released = map(float, out.stdout.split()[-2:])
    assert kept - released > 200
    source = inspect.getsource(load_algo(name).Run.restore_replay)
    assert source.index("restore_replay(") < source.index("release_freed_memory()")
