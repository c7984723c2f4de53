package docker

import (
	"github.com/docker/docker/api/types/container"

	"github.com/rollbox/rollbox/sandbox"
)

// ContainerConfig is the configuration Create gives spec's container, for
// benchmarks that compare a sandbox with a plain container of the same
// runtime and flags.
func (b *Backend) ContainerConfig(spec sandbox.Spec, imageID string) (*container.Config, *container.HostConfig) {
	return b.containerConfig(spec.WithDefaults(), imageID)
}

// FullID is the container's whole id (Info has its first 12 characters).
func (c *Container) FullID() string { return c.id }
