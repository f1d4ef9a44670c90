-- The `episodes` view: one row per episode of the pinned snapshot.
--
-- `episode_table` is the snapshot's Delta table as an Arrow dataset, so DuckDB pushes
-- projections and filters into the Parquet scan and hive partitions are pruned.
-- $restriction is empty for a whole dataset; for a DatasetView it semi-joins `view_ids`
-- (the view's episode ids), so a view's SQL only ever sees the view's episodes.
CREATE OR REPLACE TEMP VIEW episodes AS
SELECT * FROM episode_table
$restriction;
