-- Count, sum, mean, population std, min and max of one quantity from mergeable parts:
-- $n values per row, their $sum and sum of squares $sumsq, and row-wise $min / $max.
-- std = sqrt(E[x^2] - E[x]^2), clamped at 0 against rounding.
sum($n) AS "$name/count",
sum($sum) AS "$name/sum",
sum($sum) / sum($n) AS "$name/mean",
sqrt(greatest(sum($sumsq) / sum($n) - pow(sum($sum) / sum($n), 2), 0)) AS "$name/std",
min($min) AS "$name/min",
max($max) AS "$name/max"
