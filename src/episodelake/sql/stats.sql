-- Statistics of a subset of episodes in ONE aggregate over the per-episode mergeable
-- statistics written at commit time (no pass over the per-step data or the tensors).
--
-- `episode_stats` has one row per episode of the subset: "length", "return" and, for each
-- numeric per-step field <key> and channel <c>, "stats/<key>/count" (values per channel)
-- and "stats/<key>/{sum,sumsq,min,max}/<c>". $moments expands moments.sql once per
-- quantity (length, return, each field channel).
SELECT
    count(*) AS "episodes",
    $moments
FROM episode_stats;
