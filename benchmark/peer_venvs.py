"""The virtualenvs of the CartPole peers that pin packages of their own, beside the project's and apart from each
other: benchmark/rllib-venv (ray[rllib], its own gymnasium) and benchmark/sf-venv (Sample Factory 2.1.1: numpy < 2,
gymnasium < 1), from benchmark/requirements-peer-rllib.txt and requirements-peer-sf.txt. The Atari peer's is made by
`python benchmark/atari.py peer-venv`.

  python benchmark/peer_venvs.py             # both
  python benchmark/peer_venvs.py rllib       # one
"""

import argparse
import subprocess
import sys
from pathlib import Path

BENCHMARK = Path(__file__).resolve().parent
VENVS = {"rllib": "requirements-peer-rllib.txt", "sf": "requirements-peer-sf.txt"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", choices=sorted(VENVS), default=sorted(VENVS))
    for name in parser.parse_args().names:
        venv = BENCHMARK / f"{name}-venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "-r", str(BENCHMARK / VENVS[name])], check=True)
        print(f"{venv}: ready")


if __name__ == "__main__":
    main()
