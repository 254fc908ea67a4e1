package discovery

import (
	"fmt"
	"strconv"
	"strings"
)

// VersionPolicy is what the operator expects of one kind of device's
// driver: an exact version, a minimum, or both (Exact wins). The zero
// VersionPolicy expects nothing, and the check reports only what it found.
type VersionPolicy struct {
	// Exact is the one version allowed, such as "550.54.15".
	Exact string
	// Minimum is the lowest version allowed, compared number by number
	// ("23.0.3" < "23.0.10" < "24.1").
	Minimum string
}

// Condition is the outcome of one check, shaped like a Kubernetes
// condition.
type Condition struct {
	// Type names the check: "GPUDriverVersion", "NPUDriverVersion",
	// "KAEDriverVersion" or "Identity".
	Type string
	// Status is ConditionTrue, ConditionFalse or ConditionUnknown.
	Status string
	// Reason is a CamelCase word (VersionMatches, VersionTooOld,
	// VersionMismatch, VersionUnknown, NoPolicy, Found, NotFound).
	Reason string
	// Message says what was found and, when it fails, what to do.
	Message string
}

// Condition statuses.
const (
	ConditionTrue    = "True"
	ConditionFalse   = "False"
	ConditionUnknown = "Unknown"
)

// checkVersion compares the driver version found for kind with policy.
// found is "" if the driver exposes none.
func checkVersion(kind DeviceKind, found string, policy VersionPolicy) Condition {
	c := Condition{Type: string(kind) + "DriverVersion"}
	switch {
	case policy.Exact == "" && policy.Minimum == "":
		c.Status, c.Reason = ConditionTrue, "NoPolicy"
		c.Message = fmt.Sprintf("%s driver %s; no version expected", kind, orUnknown(found))
	case found == "":
		c.Status, c.Reason = ConditionUnknown, "VersionUnknown"
		c.Message = fmt.Sprintf("%s driver exposes no version; expected %s", kind, policy)
	case policy.Exact != "":
		if compareVersions(found, policy.Exact) == 0 {
			c.Status, c.Reason = ConditionTrue, "VersionMatches"
			c.Message = fmt.Sprintf("%s driver %s as expected", kind, found)
		} else {
			c.Status, c.Reason = ConditionFalse, "VersionMismatch"
			c.Message = fmt.Sprintf("%s driver %s, expected %s: install the expected driver or change the policy", kind, found, policy.Exact)
		}
	default:
		if compareVersions(found, policy.Minimum) >= 0 {
			c.Status, c.Reason = ConditionTrue, "VersionMatches"
			c.Message = fmt.Sprintf("%s driver %s, at least %s as expected", kind, found, policy.Minimum)
		} else {
			c.Status, c.Reason = ConditionFalse, "VersionTooOld"
			c.Message = fmt.Sprintf("%s driver %s is older than the minimum %s: upgrade the driver", kind, found, policy.Minimum)
		}
	}
	return c
}

func (p VersionPolicy) String() string {
	if p.Exact != "" {
		return p.Exact
	}
	return ">= " + p.Minimum
}

func orUnknown(s string) string {
	if s == "" {
		return "(version unknown)"
	}
	return s
}

// compareVersions compares two dotted versions number by number; a part
// that is not a number ("3rc1", "V100R001C15") compares as text, and a
// missing part counts as 0 ("24.1" == "24.1.0"). It returns -1, 0 or 1.
func compareVersions(a, b string) int {
	as, bs := splitVersion(a), splitVersion(b)
	for i := range max(len(as), len(bs)) {
		x, y := "0", "0"
		if i < len(as) {
			x = as[i]
		}
		if i < len(bs) {
			y = bs[i]
		}
		xn, xerr := strconv.ParseUint(x, 10, 64)
		yn, yerr := strconv.ParseUint(y, 10, 64)
		switch {
		case xerr == nil && yerr == nil:
			if xn != yn {
				if xn < yn {
					return -1
				}
				return 1
			}
		case x != y:
			return strings.Compare(x, y)
		}
	}
	return 0
}

func splitVersion(v string) []string {
	return strings.FieldsFunc(strings.TrimSpace(v), func(r rune) bool { return r == '.' || r == '-' || r == '_' })
}
