import sys

from streamfilter.cli.main import main

sys.exit(main())
