"""A served process stops on SIGTERM/SIGINT whenever the signal lands (`ppre.commands.StopRequest`,
`serve_forever`). CPython runs a signal handler in the main thread between two of its bytecodes;
a handler that set a `threading.Event` could land while that thread held the Event's lock inside
`Event.wait` and wait on itself for ever (a `ppre client serve` did, under load, after SIGTERM).
Here a one-shot timer signal lands at a random moment of the wait, 3,000 times: the waiting loop
must end every time. An Event-based handler hangs in this loop within seconds."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

STORM = """
import random, signal, sys
sys.path.insert(0, {root!r})
from ppre.commands import StopRequest
rng = random.Random(1)
for _ in range(3000):
    stop = StopRequest()
    signal.signal(signal.SIGALRM, stop.ask)
    signal.setitimer(signal.ITIMER_REAL, rng.uniform(1e-5, 3e-4))
    stop.wait(1e-5)
print("stopped every time")
"""


def test_a_stop_signal_ends_the_wait_whenever_it_lands():
    done = subprocess.run([sys.executable, "-c", STORM.format(root=str(ROOT))], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and "stopped every time" in done.stdout, done.stderr
