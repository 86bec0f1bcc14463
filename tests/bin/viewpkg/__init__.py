"""A package for `python -m viewpkg.view`: the bootstrap must run it as python -m does."""
