"""The command line as people and scripts use it: the real process against the API emulator."""
