-- Length and return at a glance: count, mean, min, median, 90th percentile and max of the episode
-- lengths and returns (the median and the percentile interpolated between neighbours).
-- Run: episodelake sql PATH --file sql/length_return_summary.sql
SELECT
    count(*) AS episodes,
    avg(length) AS mean_length,
    min(length) AS min_length,
    quantile_cont(length, 0.5) AS median_length,
    quantile_cont(length, 0.9) AS p90_length,
    max(length) AS max_length,
    avg("return") AS mean_return,
    min("return") AS min_return,
    quantile_cont("return", 0.5) AS median_return,
    quantile_cont("return", 0.9) AS p90_return,
    max("return") AS max_return
FROM episodes
