from runtime import main

raise SystemExit(main())
