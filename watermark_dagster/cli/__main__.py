"""``python -m watermark_dagster.cli`` runs the ``watermark`` command line."""

import sys

from watermark_dagster.cli.app import main

sys.exit(main())
