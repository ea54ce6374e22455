package io.pmemblk.cli;

/** {@code --route auto|cpu|dma} of bench and tune: forces every request to one route, or keeps the thresholds. */
final class RouteOption {
    private RouteOption() {}

    /** @return false (after printing why) when the route cannot be used with this device */
    static boolean apply(Device device, String route) {
        switch (route) {
            case "auto", "cpu" -> {
                return route.equals("auto") || device.forceRoute(io.pmemblk.queueing.Route.CPU);
            }
            case "dma" -> {
                if (!device.forceRoute(io.pmemblk.queueing.Route.DMA)) {
                    System.err.println("pmemblk: --route dma needs a DMA engine; allowed: --set dma.engine=soft");
                    return false;
                }
                return true;
            }
            default -> {
                return false;
            }
        }
    }
}
