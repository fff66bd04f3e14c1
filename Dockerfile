# promptline consumer image: a static binary on a distroless base, run as
# a non-root user. Build from the repository root:
#   docker build -t promptline/consumer .
# deployments/compose/compose_test.go runs the `go build` line below as it
# stands (no Docker engine there) and checks that it yields a static binary.

FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags=-s -o /out/consumer ./cmd/consumer

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/consumer /usr/local/bin/consumer
# distroless's "nonroot" user; numeric so that runAsNonRoot can verify it.
USER 65532:65532
EXPOSE 9464
ENTRYPOINT ["/usr/local/bin/consumer"]
