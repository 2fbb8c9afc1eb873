package slowpath

import (
	"fmt"
	"runtime"
)

// Config configures the userspace data plane.
type Config struct {
	// CPUs lists the CPUs to run one worker each on. Empty: Workers
	// workers on CPUs 0..Workers-1, or one per online CPU when Workers is 0.
	CPUs     []int
	Workers  int
	MaxFlows int // default 65536
}

func (c *Config) setDefaults() error {
	if c.MaxFlows == 0 {
		c.MaxFlows = 65536
	}
	if len(c.CPUs) == 0 {
		n := c.Workers
		if n == 0 {
			n = runtime.NumCPU()
		}
		for i := range n {
			c.CPUs = append(c.CPUs, i%runtime.NumCPU())
		}
	}
	for _, cpu := range c.CPUs {
		if cpu < 0 || cpu >= runtime.NumCPU() {
			return fmt.Errorf("cpu %d: not online (0-%d)", cpu, runtime.NumCPU()-1)
		}
	}
	if len(c.CPUs) > 256 {
		return fmt.Errorf("%d workers: at most 256", len(c.CPUs))
	}
	return nil
}
