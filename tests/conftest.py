import signal
import sys
from pathlib import Path

# Tests import the fixture builders from the repository's fixtures/ package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# A suite started with SIGINT ignored (from a background job or under nohup) would pass that on
# to every rlx-amp it starts, which then rightly leaves SIGINT ignored (`exits.stop_handlers`),
# and the tests that interrupt a run would fail. Python's own handler here gives the runs the
# default disposition (an exec resets a handled signal, not an ignored one).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
