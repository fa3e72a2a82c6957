from geoprobe.cli.app import main

main()
