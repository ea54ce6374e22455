package io.pmemblk.cli;

/**
 * {@code --route auto|cpu|dma} of bench: forces every request to one route, or keeps the thresholds, which the
 * in-process load generator's requests go by as caller memory does ({@link Device#routeInProcess}).
 */
final class RouteOption {
    private RouteOption() {}

    /** @return false (after printing why) when the route cannot be used with this device */
    static boolean apply(Device device, String route) {
        switch (route) {
            case "auto" -> {
                device.routeInProcess();
                return true;
            }
            case "cpu" -> {
                return device.forceRoute(io.pmemblk.queueing.Route.CPU);
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
