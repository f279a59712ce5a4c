"""Bundled study files, installed as package data of ``fednet.studies``.

``fednet run quickstart`` finds ``quickstart.toml`` here (:func:`fednet.cli.bundled_studies`);
``approx_gc_batched.py`` is a stand-alone driver (``python -m fednet.studies.approx_gc_batched``).
"""
