-- The `steps` view: one row per transition, unnested from the list columns of `episodes`.
--
-- Columns: episode_id, t (0 .. length - 1), terminated / truncated (true only on an
-- episode's last transition), then every small per-step field by key. An episode has
-- T transitions and T + 1 observation rows: an observation field "<key>" is row t (where
-- action t was taken) and "next_<key>" is row t + 1 (what the action produced).
-- $unnest and $columns are generated from the schema: per field, `unnest(<list>) AS "<name>"`
-- and `"<name>"`. Zipped unnests of equal-length lists give one row per t.
CREATE OR REPLACE TEMP VIEW steps AS
SELECT
    episode_id,
    t,
    terminated AND t = length - 1 AS terminated,
    truncated AND t = length - 1 AS truncated$columns
FROM (
    SELECT episode_id, length, terminated, truncated, unnest(range(length)) AS t$unnest
    FROM episodes
);
