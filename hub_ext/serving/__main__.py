from .standalone import main

main()
