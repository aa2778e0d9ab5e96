import sys

from streamfilter.cli import main

sys.exit(main())
