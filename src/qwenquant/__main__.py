import sys

from qwenquant.cli import main

sys.exit(main())
