module github.com/ubkit-io/ubkit

go 1.26.0

require (
	go.uber.org/goleak v1.3.0
	golang.org/x/sys v0.50.0
)

require gopkg.in/yaml.v3 v3.0.1

require (
	github.com/kr/text v0.2.0 // indirect
	golang.org/x/net v0.62.0
)
