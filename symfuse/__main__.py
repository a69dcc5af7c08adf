import sys

from symfuse.cli import main

sys.exit(main())
