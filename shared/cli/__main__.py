from shared.cli.main import main

main()
