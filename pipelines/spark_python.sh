#!/bin/sh
# The Python that Spark starts its Python workers with, in sessions made by
# pipelines/click_counts.py:spark_session (PYSPARK_PYTHON; the real interpreter is
# $CANOPY_SPARK_PYTHON).
#
# Spark puts $SPARK_HOME/python/lib/pyspark.zip first on every worker's PYTHONPATH. A zip
# carries no compiled bytecode, so every fresh worker compiles the pyspark modules it
# imports from source: 0.5-0.7 s of CPU here (idle machine), paid by each streaming query's
# python_streaming_source_runner, which Spark starts anew for every query. When SPARK_HOME
# is the pip-installed pyspark package itself, the very same modules are importable from
# site-packages with their cached bytecode, so the zip is left out; any other SPARK_HOME
# (a Spark distribution) is left alone.
if [ -n "$SPARK_HOME" ] && [ -f "$SPARK_HOME/__init__.py" ] && [ -n "$PYTHONPATH" ]; then
    PYTHONPATH=$(printf '%s\n' "$PYTHONPATH" | tr ':' '\n' \
        | grep -vxF "$SPARK_HOME/python/lib/pyspark.zip" | paste -sd: -)
    export PYTHONPATH
fi
exec "${CANOPY_SPARK_PYTHON:-python3}" "$@"
