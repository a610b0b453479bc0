from framework.cli import main

main()
