"""`python -m gateway` runs the adk-gateway command."""

import sys

from .cli import main

sys.exit(main())
