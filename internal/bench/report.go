package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// Measurement is what one run of one contender produced.
type Measurement struct {
	Value   float64   // in the case's unit
	Samples []float64 // latency samples in ns, for latency cases
	// P50 and P99 in ns, for latency cases measured by an outside program
	// that reports percentiles rather than samples.
	P50, P99 float64
	// Extra are further figures of the run, by name: what the thing
	// measured says about itself (a simulator's own lateness, say).
	Extra map[string]float64
}

// Contender is one implementation of a case: ubkit or a baseline.
type Contender struct {
	Name string
	// Role says how a baseline compares with ubkit; the zero value is an
	// Alternative doing the same work.
	Role Role
	// About says what a Reference is; the report shows it in place of a
	// comparison.
	About string
	// Run runs the case for about d and measures it. Both ends of the work
	// must run in separate processes.
	Run func(d time.Duration) (Measurement, error)
}

// Case is one benchmark: ubkit's contender (named "ubkit") and its baselines.
//
// Its unit and better direction say how values compare: a higher-is-better
// unit is a rate (compared by ratio, "6.3x the throughput"); a lower-is-better
// time (ns/op, ns, ms) is compared by ratio as faster or slower; a unit ending
// in " added" ("ns added", "fds added") is a difference from a reference,
// compared by difference, since it may be near or below zero.
type Case struct {
	Name   string
	Unit   string
	Better string // "lower" or "higher"
	// Latency cases report the median of all samples as the value, with p50,
	// p99 and p99.9 from the samples.
	Latency    bool
	Contenders []Contender
	// Verdict, if set, says whether the result met the case's target and,
	// if not, by how much it missed; the report prints it under the table
	// and keeps it in the JSON row.
	Verdict func(Result) string
	// WarmupRounds, if set, are rounds run like the measured ones
	// (contenders in turn, the run's duration) and not measured, in place
	// of the one short warm-up run: for cases against a server whose JIT
	// compiles its hot paths during the first thousands of requests (a
	// JVM broker), which would otherwise be measured while it does.
	WarmupRounds int
}

// Options control a suite run.
type Options struct {
	Rounds   int           // measured rounds per contender
	Duration time.Duration // per run
	Warmup   time.Duration // one unmeasured run per contender
	Progress io.Writer     // progress lines, or nil
}

// Stats summarises one contender's rounds.
type Stats struct {
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
	P50    float64 `json:"p50,omitempty"`
	P99    float64 `json:"p99,omitempty"`
	P999   float64 `json:"p999,omitempty"`
	// Noise is how far a round's value typically strays from the median:
	// the median of their distances from it, which one spoiled round does
	// not move (Max and Min do). Comparisons call differences within the
	// noise the same.
	Noise  float64 `json:"noise,omitempty"`
	Rounds int     `json:"rounds"`
	Error  string  `json:"error,omitempty"`
	// Extra holds the rounds' extra figures, by name, in the order of the
	// rounds.
	Extra map[string][]float64 `json:"extra,omitempty"`
}

// Result is one row of a report.
type Result struct {
	Case      string             `json:"case"`
	Unit      string             `json:"unit"`
	Better    string             `json:"better"`
	Value     float64            `json:"value"`
	Baselines map[string]float64 `json:"baselines"`
	Detail    map[string]Stats   `json:"detail"`
	// Compare says in words how ubkit's value compares with each
	// baseline's ("211x faster", "0.8x the throughput", "adds 59 µs less"),
	// by baseline name; a failed baseline has none.
	Compare map[string]string `json:"compare,omitempty"`
	// Note explains ubkit's value where it needs it: an added latency below
	// zero ("within noise: -3 µs (±12 µs)").
	Note string `json:"note,omitempty"`
	// Roles names the baselines that are not alternatives doing the same
	// work: "limit" (a bound for ubkit's value) or "reference" (a figure of
	// another kind, such as the direct path's latency under an added
	// latency, in the unit without " added").
	Roles map[string]string `json:"roles,omitempty"`
	// Verdict is a case's judgement of its own figures, if it has one
	// (the simulator's latency against its configured targets).
	Verdict string `json:"verdict,omitempty"`
}

// roleNames are Roles' values in a Result.
var roleNames = map[Role]string{Limit: "limit", Reference: "reference"}

// Report is a suite's output.
type Report struct {
	Suite   string   `json:"suite"`
	Machine string   `json:"machine,omitempty"`
	Date    string   `json:"date,omitempty"`
	Results []Result `json:"results"`
}

// Run measures every case: after a warm-up it runs the contenders in turn,
// round after round (A B C A B C ...), so drift on a shared machine hits all
// of them alike.
func Run(suite string, cases []Case, o Options) (*Report, error) {
	rep := &Report{Suite: suite, Machine: Machine(), Date: time.Now().UTC().Format(time.DateOnly)}
	for _, c := range cases {
		values := make([][]float64, len(c.Contenders))
		samples := make([][]float64, len(c.Contenders))
		p50s := make([][]float64, len(c.Contenders))
		p99s := make([][]float64, len(c.Contenders))
		extras := make([]map[string][]float64, len(c.Contenders))
		errs := make([]error, len(c.Contenders))
		for i, k := range c.Contenders {
			if o.Warmup > 0 && c.WarmupRounds == 0 {
				if _, err := k.Run(o.Warmup); err != nil {
					errs[i] = err
				}
			}
		}
		for r := range c.WarmupRounds {
			for i, k := range c.Contenders {
				if errs[i] != nil {
					continue
				}
				if _, err := k.Run(o.Duration); err != nil {
					errs[i] = err
				}
				if o.Progress != nil {
					fmt.Fprintf(o.Progress, "  %s warm-up round %d %s\n", c.Name, r+1, k.Name)
				}
			}
		}
		for r := range o.Rounds {
			for i, k := range c.Contenders {
				if errs[i] != nil {
					continue
				}
				m, err := k.Run(o.Duration)
				if err != nil {
					errs[i] = err
					continue
				}
				values[i] = append(values[i], m.Value)
				samples[i] = append(samples[i], m.Samples...)
				if m.P50 > 0 {
					p50s[i] = append(p50s[i], m.P50)
					p99s[i] = append(p99s[i], m.P99)
				}
				for name, v := range m.Extra {
					if extras[i] == nil {
						extras[i] = map[string][]float64{}
					}
					extras[i][name] = append(extras[i][name], v)
				}
				if o.Progress != nil {
					fmt.Fprintf(o.Progress, "  %s round %d %s: %.4g %s\n", c.Name, r+1, k.Name, m.Value, c.Unit)
				}
			}
		}
		res := Result{Case: c.Name, Unit: c.Unit, Better: c.Better, Baselines: map[string]float64{}, Detail: map[string]Stats{},
			Compare: map[string]string{}}
		for i, k := range c.Contenders {
			st := summarize(values[i], samples[i], c.Latency)
			st.Extra = extras[i]
			if c.Latency && len(samples[i]) == 0 && len(p50s[i]) > 0 {
				slices.Sort(p50s[i])
				slices.Sort(p99s[i])
				st.P50, st.P99 = percentile(p50s[i], 0.5), percentile(p99s[i], 0.5)
			}
			if errs[i] != nil {
				st.Error = errs[i].Error()
				if k.Name == "ubkit" {
					return nil, fmt.Errorf("%s/%s: %w", suite, c.Name, errs[i])
				}
			}
			res.Detail[k.Name] = st
			v := st.value()
			if k.Name == "ubkit" {
				res.Value = v
			} else if errs[i] == nil {
				res.Baselines[k.Name] = v
			}
		}
		res.describe(c)
		if c.Verdict != nil {
			res.Verdict = c.Verdict(res)
		}
		rep.Results = append(rep.Results, res)
	}
	return rep, nil
}

// describe words how ubkit compares with each baseline of c that ran, and
// ubkit's own value where it needs a note.
func (res *Result) describe(c Case) {
	k := kindOf(res.Unit, res.Better)
	u := res.figure("ubkit")
	res.Note = note(k, res.Unit, u)
	for _, ct := range c.Contenders {
		if ct.Name == "ubkit" {
			continue
		}
		if name, ok := roleNames[ct.Role]; ok {
			if res.Roles == nil {
				res.Roles = map[string]string{}
			}
			res.Roles[ct.Name] = name
		}
		if _, ok := res.Baselines[ct.Name]; ok {
			res.Compare[ct.Name] = compare(k, res.Unit, ct.Role, ct.About, u, res.figure(ct.Name))
		}
	}
}

// figure is a contender's value (its p50 for a latency case) and noise.
func (res *Result) figure(name string) figure {
	st := res.Detail[name]
	return figure{value: st.value(), noise: st.Noise}
}

// value is the figure a contender is compared by: the p50 where there is
// one, else the median of its rounds.
func (st Stats) value() float64 {
	if st.P50 > 0 {
		return st.P50
	}
	return st.Median
}

func summarize(values, samples []float64, latency bool) Stats {
	var st Stats
	st.Rounds = len(values)
	if len(values) == 0 {
		return st
	}
	slices.Sort(values)
	st.Median, st.Min, st.Max = percentile(values, 0.5), values[0], values[len(values)-1]
	dev := make([]float64, len(values))
	for i, v := range values {
		dev[i] = math.Abs(v - st.Median)
	}
	slices.Sort(dev)
	st.Noise = percentile(dev, 0.5)
	if latency && len(samples) > 0 {
		slices.Sort(samples)
		st.P50, st.P99, st.P999 = percentile(samples, 0.5), percentile(samples, 0.99), percentile(samples, 0.999)
	}
	return st
}

func percentile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// WriteJSON writes the report as one JSON document.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteTable writes the report as a human-readable table: each contender's
// value, p99 and spread, and in words how ubkit compares with each
// baseline.
func (r *Report) WriteTable(w io.Writer) error {
	fmt.Fprintf(w, "suite %s  (%s, %s)\n", r.Suite, r.Machine, r.Date)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "case\tcontender\tvalue\tunit\tp99\tspread\t  ubkit, compared")
	for _, res := range r.Results {
		k := kindOf(res.Unit, res.Better)
		names := []string{"ubkit"}
		for n := range res.Detail {
			if n != "ubkit" {
				names = append(names, n)
			}
		}
		slices.Sort(names[1:])
		for i, n := range names {
			st := res.Detail[n]
			c := ""
			if i == 0 {
				c = res.Case
			}
			if st.Error != "" {
				fmt.Fprintf(tw, "%s\t%s\t\t\t\t\t  error: %s\n", c, n, firstLine(st.Error))
				continue
			}
			p99 := ""
			if st.P99 > 0 {
				p99 = human(st.P99)
			}
			words, unit, kn := res.Compare[n], res.Unit, k
			if n == "ubkit" {
				words = res.Note
			}
			if res.Roles[n] == "reference" {
				unit = strings.TrimSuffix(unit, " added")
				kn = kindOf(unit, res.Better)
			}
			if words != "" {
				// The last cell, left as it is after the right-aligned
				// columns.
				words = "  " + words
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", c, n, human(st.value()), unit, p99, spread(kn, st), words)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, `spread: half the range of the rounds' values, as a share of the value (in the unit for "added" cases, which hover near 0)`)
	for _, res := range r.Results {
		if res.Verdict != "" {
			fmt.Fprintf(w, "%s: %s\n", res.Case, res.Verdict)
		}
	}
	return nil
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	if len(s) > 60 {
		return s[:60] + "..."
	}
	return s
}

// human formats a value for the table's columns: 123.7k, 1.20M, 241,
// 3.14, -2.1k.
func human(v float64) string {
	switch {
	case !finite(v):
		return fmt.Sprint(v) // NaN, +Inf, -Inf
	case v < 0:
		return "-" + human(-v)
	case v >= 1e9:
		return fmt.Sprintf("%.2fG", v/1e9)
	case v >= 1e6:
		return fmt.Sprintf("%.2fM", v/1e6)
	case v >= 1e4:
		return fmt.Sprintf("%.1fk", v/1e3)
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.3g", v)
}
