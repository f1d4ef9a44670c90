-- The `episodes` view: one row per episode of the pinned snapshot.
--
-- `episode_table` is the snapshot's Delta table as an Arrow dataset, so DuckDB pushes
-- projections and filters into the Parquet scan and hive partitions are pruned.
-- $derived and $join are empty without derived columns; with them, the snapshot's derived values
-- (`derived_table`, one row per episode) are left-joined by episode_id (NULL: never set).
-- $restriction is empty for a whole dataset; for a DatasetView it semi-joins `view_ids`
-- (the view's episode ids), so a view's SQL only ever sees the view's episodes.
CREATE OR REPLACE TEMP VIEW episodes AS
SELECT episode_table.*$derived FROM episode_table
$join
$restriction;
