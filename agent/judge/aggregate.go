package judge

import (
	"math"
	"slices"
)

// Combine combines judges' scores of one rubric (how: mean, median, min,
// trimmed_mean; trim the fraction cut from each end of a trimmed mean, 0
// for the default: one score from each end when there are three or more).
// It returns NaN for no scores.
func Combine(how string, trim float64, scores []float64) float64 {
	n := len(scores)
	if n == 0 {
		return math.NaN()
	}
	s := slices.Clone(scores)
	slices.Sort(s)
	switch how {
	case AggMin:
		return s[0]
	case AggMedian:
		if n%2 == 1 {
			return s[n/2]
		}
		return (s[n/2-1] + s[n/2]) / 2
	case AggTrimmedMean:
		k := 0
		if trim > 0 {
			k = int(math.Floor(float64(n) * trim))
		} else if n >= 3 {
			k = 1
		}
		k = min(k, (n-1)/2)
		return mean(s[k : n-k])
	}
	return mean(s)
}

func mean(s []float64) float64 {
	var sum float64
	for _, v := range s {
		sum += v
	}
	return sum / float64(len(s))
}

// WeightedMean is the weighted mean of values (NaN when the weights sum
// to 0).
func WeightedMean(values, weights []float64) float64 {
	var sum, wsum float64
	for i, v := range values {
		sum += weights[i] * v
		wsum += weights[i]
	}
	if wsum == 0 {
		return math.NaN()
	}
	return sum / wsum
}

// round9 rounds away float noise, so equal inputs give equal rewards
// whatever the order of summation.
func round9(v float64) float64 { return math.Round(v*1e9) / 1e9 }
