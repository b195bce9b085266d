package driver

// The bounds CheckOp holds params and counts to, for the external tests, which
// compare them with the root package's.
const (
	MaxTokensForTest = maxTokens
	MaxPeriodForTest = maxPeriod
	MinRateForTest   = minRate
	MinCountForTest  = minCount
)
