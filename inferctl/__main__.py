from inferctl.cli import main

raise SystemExit(main())
