"""Put on PYTHONPATH of every torchrun run that tests/conftest.py's Runner.run expects to finish: at the very end of
each rank's interpreter (registered first by `site`, so it runs after every exit handler of the file itself), exit
70 when a gloo thread is still running. Such a thread can free a tensor after the interpreter is gone and abort the
rank ("terminate called without an active exception", exit -6): it did in 3 of 33 runs of DD-PPO's preemption test
on one CPU, because torch.optim imports torch._dynamo on first use and, imported once the group existed, that kept
the group alive past destroy_process_group."""

import atexit
import os
import sys


def fail_if_gloo_threads_are_left():
    names = [open(f"/proc/self/task/{task}/comm").read().strip() for task in os.listdir("/proc/self/task")]
    left = [name for name in names if "gloo" in name]
    if left:
        sys.stderr.write(f"gloo threads left at interpreter exit: {left}\n")
        sys.stderr.flush()
        os._exit(70)


atexit.register(fail_if_gloo_threads_are_left)
