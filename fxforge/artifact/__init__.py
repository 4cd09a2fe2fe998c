"""What a compile returns and how it runs: ``Compiled``, its statistics (``stats``), and the
check of a call's inputs."""
