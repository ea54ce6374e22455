package io.pmemblk.queueing;

/** Who copied a request's data: a CPU core (memcpy) or a DMA channel. */
public enum Route {
    CPU, DMA;

    public String label() {
        return this == CPU ? "cpu" : "dma";
    }
}
