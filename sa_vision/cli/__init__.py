""" The command-line tools, installed as ``sa-vision-*`` commands (``pyproject.toml``'s ``[project.scripts]``) """
