-- The distribution of episode returns: how many episodes fall in each bin of width $bin_width
-- (bin_start is the bin's lower edge, floor(return / width) * width), empty bins left out.
-- Run: episodelake sql PATH --file sql/return_distribution.sql --param bin_width=0.5
SELECT
    floor("return" / $bin_width) * $bin_width AS bin_start,
    count(*) AS episodes
FROM episodes
GROUP BY bin_start
ORDER BY bin_start
