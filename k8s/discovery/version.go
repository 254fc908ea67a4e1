package discovery

import (
	"fmt"
	"strconv"
	"strings"
)

// VersionPolicy is what the operator expects of a version (a kind of
// device's driver or firmware, the kernel): an exact version, a minimum,
// or both (Exact wins). The zero VersionPolicy expects nothing, and the
// check reports only what it found.
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
	// Type names the check: "Identity"; "GPUDriverVersion",
	// "NPUDriverVersion", "KAEDriverVersion" (against
	// ScanOptions.Versions); "GPUFirmwareVersion", "NPUFirmwareVersion"
	// (against ScanOptions.Firmware); "NPUFirmwareCompatible" (the
	// Ascend driver's own list of the firmware it works with);
	// "KernelVersion" (against ScanOptions.Kernel).
	Type string
	// Status is ConditionTrue, ConditionFalse or ConditionUnknown.
	Status string
	// Reason is a CamelCase word (VersionMatches, VersionTooOld,
	// VersionMismatch, VersionUnknown, NoPolicy, Compatible,
	// Incompatible, Found, NotFound, InvalidName).
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

// checkVersion compares the versions found of one thing with policy: typ
// is the condition's type, subject names the thing ("NPU driver", "GPU
// firmware", "kernel") and noun what to install or upgrade ("driver").
// found holds the distinct versions exposed: one for a node-wide version,
// one per version among the devices for per-device firmware (a GPU's
// VBIOS); none if nothing exposes one. Every one of them must satisfy
// policy.
func checkVersion(typ, subject, noun string, found []string, policy VersionPolicy) Condition {
	c := Condition{Type: typ}
	all := strings.Join(found, ", ")
	switch {
	case policy.Exact == "" && policy.Minimum == "":
		c.Status, c.Reason = ConditionTrue, "NoPolicy"
		c.Message = fmt.Sprintf("%s %s; no version expected", subject, orUnknown(all))
	case len(found) == 0:
		c.Status, c.Reason = ConditionUnknown, "VersionUnknown"
		c.Message = fmt.Sprintf("%s exposes no version; expected %s", subject, policy)
	case policy.Exact != "":
		if bad := versionsWhere(found, func(v string) bool { return compareVersions(v, policy.Exact) != 0 }); bad == "" {
			c.Status, c.Reason = ConditionTrue, "VersionMatches"
			c.Message = fmt.Sprintf("%s %s as expected", subject, all)
		} else {
			c.Status, c.Reason = ConditionFalse, "VersionMismatch"
			c.Message = fmt.Sprintf("%s %s, expected %s: install the expected %s or change the policy", subject, bad, policy.Exact, noun)
		}
	default:
		if bad := versionsWhere(found, func(v string) bool { return compareVersions(v, policy.Minimum) < 0 }); bad == "" {
			c.Status, c.Reason = ConditionTrue, "VersionMatches"
			c.Message = fmt.Sprintf("%s %s, at least %s as expected", subject, all, policy.Minimum)
		} else {
			c.Status, c.Reason = ConditionFalse, "VersionTooOld"
			c.Message = fmt.Sprintf("%s %s is older than the minimum %s: upgrade the %s", subject, bad, policy.Minimum, noun)
		}
	}
	return c
}

// versionsWhere joins the versions for which bad is true.
func versionsWhere(versions []string, bad func(string) bool) string {
	var out []string
	for _, v := range versions {
		if bad(v) {
			out = append(out, v)
		}
	}
	return strings.Join(out, ", ")
}

// versionRange is an inclusive range of versions, as Ascend's version
// files list them: "[7.0.0,7.5.99]".
type versionRange struct{ Low, High string }

func (r versionRange) contains(v string) bool {
	return compareVersions(r.Low, v) <= 0 && compareVersions(v, r.High) <= 0
}

// checkCompatible is the check the Ascend driver's version file asks for:
// the firmware's version must be in one of the ranges the driver lists
// (its compatible_version_fw).
func checkCompatible(firmware, driver string, ranges []versionRange) Condition {
	c := Condition{Type: "NPUFirmwareCompatible"}
	var list []string
	for _, r := range ranges {
		if r.contains(firmware) {
			c.Status, c.Reason = ConditionTrue, "Compatible"
			c.Message = fmt.Sprintf("NPU firmware %s is in the range [%s, %s] that driver %s works with", firmware, r.Low, r.High, driver)
			return c
		}
		list = append(list, "["+r.Low+", "+r.High+"]")
	}
	c.Status, c.Reason = ConditionFalse, "Incompatible"
	c.Message = fmt.Sprintf("NPU firmware %s is not one driver %s works with (%s): install a firmware in those ranges, or a driver that takes this firmware", firmware, driver, strings.Join(list, ", "))
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
