"""Messages of ``jobfence.v1`` generated from ``proto/`` by
``python/tools/gen_stubs.py`` (checked against ``proto/`` by
``python/tests/test_stubs.py``). Do not edit."""
