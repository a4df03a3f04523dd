"""scripts/, the docs and the site, the Makefile, and the fixtures' self-tests."""
