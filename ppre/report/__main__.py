"""``python -m ppre.report RESULT.json DIR``: a report from a saved ``--json`` result
(`ppre.report.main`)."""
import sys

from ppre.report import main

sys.exit(main())
