-- Count, sum, mean, population std, min and max of one quantity from mergeable parts:
-- $n values per row, their $sum and sum of squares $sumsq, and row-wise $min / $max.
-- std = sqrt(E[x^2] - E[x]^2), clamped at 0 against rounding; NULL (no values) stays NULL.
sum($n) AS "$name/count",
sum($sum) AS "$name/sum",
sum($sum) / sum($n) AS "$name/mean",
CASE WHEN sum($n) > 0 THEN sqrt(greatest(sum($sumsq) / sum($n) - pow(sum($sum) / sum($n), 2), 0)) END AS "$name/std",
min($min) AS "$name/min",
max($max) AS "$name/max"
