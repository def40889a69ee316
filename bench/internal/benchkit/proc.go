package benchkit

import (
	"bufio"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// LoadAverage returns the 1-minute load average of the machine
// (/proc/loadavg), or -1 when it cannot be read.
func LoadAverage() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return -1
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return -1
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return -1
	}
	return v
}

// Machine describes where a benchmark ran, for the header of its output.
func Machine() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("host %s, %d CPUs, load %.2f, %s", host, cpus(), LoadAverage(), time.Now().UTC().Format(time.RFC3339))
}

func cpus() int {
	n := 0
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return -1
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "processor") {
			n++
		}
	}
	return n
}

// Memory is a process's resident memory: VmRSS now and its peak VmHWM,
// in bytes (/proc/<pid>/status).
type Memory struct {
	RSS, PeakRSS int64
}

// ReadMemory reads the memory of process pid (0 for this process).
func ReadMemory(pid int) (Memory, error) {
	path := "/proc/self/status"
	if pid > 0 {
		path = fmt.Sprintf("/proc/%d/status", pid)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return Memory{}, fmt.Errorf("read memory: %w", err)
	}
	var m Memory
	for line := range strings.Lines(string(b)) {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		var dst *int64
		switch k {
		case "VmRSS":
			dst = &m.RSS
		case "VmHWM":
			dst = &m.PeakRSS
		default:
			continue
		}
		f := strings.Fields(v) // "12345 kB"
		if len(f) != 2 || f[1] != "kB" {
			return Memory{}, fmt.Errorf("read memory: %s: unexpected %q", path, line)
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return Memory{}, fmt.Errorf("read memory: %s: %w", path, err)
		}
		*dst = kb << 10
	}
	return m, nil
}

// CPUTime returns the user plus system CPU time this process used so far.
func CPUTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return -1
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// Percentile returns the p-quantile (0 < p <= 1) of sorted durations by the
// nearest-rank method: the smallest value with at least p of the samples at
// or below it. It returns 0 for no samples.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(p*float64(len(sorted)) + 0.999999999) // ceil without float noise
	return sorted[min(max(rank, 1), len(sorted))-1]
}

// Summary is the distribution of a set of durations.
type Summary struct {
	N                       int
	Min, P50, P90, P99, Max time.Duration
	Mean                    time.Duration
}

// Summarize sorts a copy of samples and summarises it.
func Summarize(samples []time.Duration) Summary {
	s := slices.Clone(samples)
	slices.Sort(s)
	if len(s) == 0 {
		return Summary{}
	}
	var sum time.Duration
	for _, d := range s {
		sum += d
	}
	return Summary{
		N: len(s), Min: s[0], Max: s[len(s)-1], Mean: sum / time.Duration(len(s)),
		P50: Percentile(s, 0.50), P90: Percentile(s, 0.90), P99: Percentile(s, 0.99),
	}
}

// Ms formats d in milliseconds with two decimals.
func Ms(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 2, 64)
}

// MiB formats n bytes in MiB with one decimal.
func MiB(n int64) string { return strconv.FormatFloat(float64(n)/(1<<20), 'f', 1, 64) }
