-- The distribution of episode lengths: how many episodes fall in each bin of $bin_width steps
-- (bin_start is the bin's lowest length), empty bins left out.
-- Run: episodelake sql PATH --file sql/length_distribution.sql --param bin_width=10
SELECT
    (length // $bin_width) * $bin_width AS bin_start,
    count(*) AS episodes
FROM episodes
GROUP BY bin_start
ORDER BY bin_start
