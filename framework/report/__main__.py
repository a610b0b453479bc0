import sys

from framework.report.cli import main

sys.exit(main())
