"""Print every probe's outcome (a debugging aid: ``python -m tests.robustness.show``)."""
import sys
import tempfile

from tests.robustness.probes import probes
from tests.robustness.runner import run

with tempfile.TemporaryDirectory() as tmp:
    for n, probe in enumerate(probes(tmp), 1):
        o = run(probe, tmp)
        flag = "" if o.kind == probe.expect else "   <<<<<<<< expected " + probe.expect
        print(f"{n:3d} {o.seconds:5.2f}s {o.kind:5s} {probe.call[:60]:60s} {o.text[:150]}{flag}")
        sys.stdout.flush()
