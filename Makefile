# ubkit: two commands do everything.
#   make demo   the main job: two processes talking through shared memory, next to a unix socket and TCP,
#               an mq.Log stream, four processes loading one model file once (the memory saved)
#               (and a simulated super node in Kubernetes, if make prereqs built its binaries)
#   make test   installs missing test prerequisites, then vet, lint, cross builds, race tests, examples

GO       ?= go
CACHE    ?= $(CURDIR)/.cache
GOLANGCI_LINT_VERSION := v2.15.0
FUZZTIME ?= 10s

export UBKIT_CACHE := $(CACHE)

.PHONY: demo test prereqs vet cross race examples bench fuzz lint clean generate

demo:
	$(GO) run ./cmd/ubctl demo

# Lint runs before the race tests: it is quicker, and names a broken layer
# rule (depguard) or unformatted file without waiting for them.
test: prereqs vet lint cross race examples

prereqs:
	@bash internal/testenv/prereqs.sh

vet:
	$(GO) vet ./...

# Every package builds for macOS, and is vetted, tests included, for
# Windows: ubkit runs on Linux, but programs that import it build anywhere
# (shm keeps its API on other systems and fails with errors.ErrUnsupported;
# README.md says which packages need Linux).
cross:
	@echo "== GOOS=darwin go build ./..."
	@GOOS=darwin $(GO) build ./...
	@echo "== GOOS=windows go vet ./..."
	@GOOS=windows $(GO) vet ./...

race:
	$(GO) test -race -count=1 ./...

# Examples are programs: build and run each one (they are also Go tests).
# An example that reads PULSAR_URL or ROCKETMQ_NAMESRV runs with that
# broker, started for it from the jars prereqs resolved.
examples:
	@set -e; for d in $$(find examples -name main.go -exec dirname {} \; 2>/dev/null | sort); do \
		echo "== $$d"; brokers=""; \
		if grep -qs PULSAR_URL $$d/*.go; then brokers="$$brokers -pulsar"; fi; \
		if grep -qs ROCKETMQ_NAMESRV $$d/*.go; then brokers="$$brokers -rocketmq"; fi; \
		brokers="$$brokers $$(sed -n 's|^// withbrokers: ||p' $$d/*.go)"; \
		if [ -n "$$(echo $$brokers)" ]; then $(GO) run ./internal/testenv/withbrokers $$brokers -- $(GO) run ./$$d; \
		else $(GO) run ./$$d; fi; \
	done

bench:
	$(GO) run ./cmd/ubctl bench all

# controller-gen (pinned in the script): deepcopy, CRDs and RBAC of k8s/.
# Check the output in; k8s/api/v1alpha1's tests fail when it is stale.
generate:
	@bash k8s/config/generate.sh

# A short run of every fuzz target.
fuzz:
	@set -e; for pkg in $$($(GO) list ./...); do \
		for f in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz' || true); do \
			echo "== $$pkg $$f"; $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) -fuzzminimizetime 2s $$pkg; \
		done; \
	done

# The pinned golangci-lint with .golangci.yaml (depguard keeps unsafe and
# system calls in shm; gofmt).
lint:
	@echo "== golangci-lint $(GOLANGCI_LINT_VERSION)"
	@$(GO) run github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION) run ./...

clean:
	rm -rf $(CACHE)
