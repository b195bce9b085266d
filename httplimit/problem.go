package httplimit

import (
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/ratelimit-go/ratelimit"
)

// QuotaExceeded is the problem type of a request refused for exceeding one
// or more quota policies, defined by draft-ietf-httpapi-ratelimit-headers-10
// (section 5.1) and sent by WithProblemDetails.
const QuotaExceeded = "https://iana.org/assignments/http-problem-types#quota-exceeded"

// problem is an RFC 9457 problem details object.
type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	// ViolatedPolicies names the quota policies the request exceeded, as
	// RateLimit-Policy names them (the draft's extension member).
	ViolatedPolicies []string `json:"violated-policies,omitempty"`
}

// quotaExceeded describes a refused request: the limits that refused it
// and, in words, when to retry (Retry-After says it for machines).
func quotaExceeded(res ratelimit.Result) problem {
	p := problem{Type: QuotaExceeded, Title: "Quota Exceeded", Status: http.StatusTooManyRequests}
	if len(res.All) == 0 {
		p.ViolatedPolicies = []string{policyName(res.Name)}
	}
	for _, r := range res.All {
		if !r.OK {
			p.ViolatedPolicies = append(p.ViolatedPolicies, policyName(r.Name))
		}
	}
	if s := retryAfterSeconds(res.RetryAfter); s > 0 {
		unit := " seconds."
		if s == 1 {
			unit = " second."
		}
		p.Detail = "Retry after " + strconv.FormatInt(s, 10) + unit
	}
	return p
}

// writeProblem answers with p as application/problem+json.
func writeProblem(w http.ResponseWriter, p problem) {
	body, err := json.Marshal(p)
	if err != nil { // cannot happen: p holds strings and ints
		http.Error(w, http.StatusText(p.Status), p.Status)
		return
	}
	h := w.Header()
	h.Del("Content-Length")
	h.Set("Content-Type", "application/problem+json")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(p.Status)
	w.Write(append(body, '\n'))
}
