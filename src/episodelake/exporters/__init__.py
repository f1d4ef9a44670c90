"""Writing a collection out in other formats: Parquet, Arrow, Polars, Minari (``formats``), LeRobot v3
(``lerobot``), Rerun recordings (``rrd``).

May import: ``importers``, ``integrations``, the façade and every folder below it.
"""
