from traintop.cli import main

raise SystemExit(main())
