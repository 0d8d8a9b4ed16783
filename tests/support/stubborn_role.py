"""A role that ignores SIGTERM and has started a process of its own (in its process group):
what a template must still end when its user goes away. Prints both pids."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    print(f"pids {helper.pid}", flush=True)
    time.sleep(120)
