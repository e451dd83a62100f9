from controller.launch import main

raise SystemExit(main())
